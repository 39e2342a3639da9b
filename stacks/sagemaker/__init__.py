"""The SageMaker stack family: one real-time endpoint per serving profile whose EC2 type SageMaker hosts
(profiles/sagemaker.toml), from the same image and the same locked GGUF as the EC2 stacks (docs/sagemaker.md)."""
