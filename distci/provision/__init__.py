"""Provision: from a Cell's declared Sources to an environment its suites run in.

sources (Source kinds, PACKAGE_AXES, nightly dates) -> index (PEP 503/691 reader) ->
wheelhouse (the offline store of a Stack's wheels) -> envs (THE venv primitive: stack
envs, overlay venvs); wheeltarget and selfwheels build the wheels the envs install.
The run stage calls `envs.stack_env`; nothing here imports a later stage.
"""
