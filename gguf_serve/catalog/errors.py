class ProfileError(ValueError):
    """A profile that cannot work; the message says what to change."""
