"""Integrations with training libraries that own the loop (the Hugging Face ``Trainer``):
each imports its library only when it is used."""
