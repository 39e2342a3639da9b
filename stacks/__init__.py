"""CDK stacks and the constructs they are built from."""
