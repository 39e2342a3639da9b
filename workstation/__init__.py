"""One GPU workstation: a catalog workstation profile served by the same launcher and fetcher as the fleet, behind
the timing hop (latencyproxy), scraped by Prometheus with the committed rules.

    python -m workstation check                          # the memory plan of every card x model, and the profiles
    python -m workstation up rtx4090-mtp                 # Docker Compose: serving image + hop + Prometheus, GPU
    python -m workstation up rtx4090-mtp --native        # the same three as processes (llama-server on PATH)
    python -m workstation down rtx4090-mtp               # stop the Compose stack
"""
