"""The control proxy's HTTP layer: routes, request and response models, the server and its TLS options.

It only translates between HTTP and :class:`agents.service.core.ControlService`.
"""
