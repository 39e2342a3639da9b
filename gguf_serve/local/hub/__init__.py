"""gguf-serve-hub: a local server that speaks ModelScope's model-hub API, with fault injection.

with LocalScope(root) as hub:          # serves <root>/<owner>/<repo>/<files>
    hub.add_file("local/gemma", "gemma.gguf", path)
    hub.faults.bandwidth_bps = 25e6     # per connection
    ... MODELSCOPE_ENDPOINT=hub.url ...
"""

from gguf_serve.local.hub.server import Faults, LocalScope, Stats

__all__ = ["Faults", "LocalScope", "Stats"]
