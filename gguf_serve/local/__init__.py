"""What runs on your machine: the local demo, the benchmark, the workstation runner and a local
ModelScope-shaped hub."""
