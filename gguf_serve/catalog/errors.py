from gguf_serve.errors import InputError


class ProfileError(InputError):
    """A profile or lock file that cannot work; the message names the file and key and says what to change."""
