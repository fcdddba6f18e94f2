from .seed_encoder import SeedEncoderModel  # noqa: F401
