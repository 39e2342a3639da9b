"""One GPU workstation: a catalog workstation profile served by the same launcher and fetcher as the fleet, behind
the timing hop (the hop), scraped by Prometheus with the committed rules.

    gguf-serve-workstation check                          # the memory plan of every card x model, and the profiles
    gguf-serve-workstation up rtx4090-mtp                 # Docker Compose: serving image + hop + Prometheus, GPU
    gguf-serve-workstation up rtx4090-mtp --native        # the same three as processes (llama-server on PATH)
    gguf-serve-workstation down rtx4090-mtp               # stop the Compose stack
"""
