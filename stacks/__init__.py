"""CDK stacks and the constructs they are built from."""

import os

# jsii prints a boxed Node.js support banner (as Python bytes literals) when its kernel starts. Node 20 is past
# end of life and the pinned CDK works on it (checked; README prerequisites): silence that one release, no other.
# Every entry point that reaches aws_cdk imports this package first (app.py, gguf-serve-preflight, the tests), so
# the switch sits here; an explicit setting in the environment wins.
os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")
os.environ.setdefault("JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION", "1")
