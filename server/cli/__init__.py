"""gradwire's command line: the worker (``gradwire-worker``) and the ``run``, ``health`` and
``inspect`` subcommands of ``gradwire`` (registered by :mod:`gradwire.server.cli.commands`).

Modules:
    settings        flags that also read GRADWIRE_* variables (one table)
    tls_settings    token and TLS flags shared by every command
    worker_config   what a worker needs to join, checked before the network is touched
    signals         SIGTERM/SIGINT handling
    worker          gradwire-worker: join, serve, leave with the job or on a signal
    run             gradwire run: the driver is a worker that runs a script, then leaves
    channel         a checked gRPC channel to one worker (token, TLS, deadlines)
    health          gradwire health: grpc.health.v1 check, exit 0/1
    inspection      gradwire inspect: table, --watch, --dot
    table           DebugInfo -> readable text
    dot             the inspect JSON contract -> Graphviz DOT
    commands        registration of the subcommands in the ``gradwire`` dispatcher
"""
