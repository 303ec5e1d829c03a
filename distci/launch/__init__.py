"""Where ranks run: one host, hosts simulated with network namespaces, Slurm, Kubernetes.

A cell of `nodes` > 1 (matrix.toml) places `world_size // nodes` ranks on each node and
starts them with torchrun's own multi-node rendezvous (c10d), one agent per node, through
an engine clusters already run. Modules: topology (the nodes and the agents' command),
netns (hosts simulated on one machine), agents (one test across nodes, judged as the
harness judges one host), plugin (`-p distci.launch.plugin`), slurm, kubernetes.
"""
