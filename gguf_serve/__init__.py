"""gguf-serve: llama.cpp serving of GGUF models on AWS China. Subpackages by where the code runs:
container (what the serving image runs, copied whole into it), catalog (the profiles, read at synth and on a
laptop), preflight (read-only checks of an account) and local (the tools that run on your machine)."""
