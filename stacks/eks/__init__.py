"""The EKS deployment target: one cluster serving several profiles from the same image, lock and signals."""
