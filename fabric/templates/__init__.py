"""Stage topology templates (OrchestrRL §5.2) and the template cache (§5.3, Phase 1)."""

from orchestrl.fabric.templates.base import Template, TemplateScope, pod_endpoint, pod_of_endpoint
from orchestrl.fabric.templates.cache import CacheEntry, TemplateCache, select_template
from orchestrl.fabric.templates.stages import GEN, TEMPLATES, TRAIN, TRAIN_DP, WEIGHT_SYNC

__all__ = [
    "Template", "TemplateScope", "pod_endpoint", "pod_of_endpoint", "CacheEntry", "TemplateCache",
    "select_template", "TEMPLATES", "TRAIN", "TRAIN_DP", "GEN", "WEIGHT_SYNC",
]
