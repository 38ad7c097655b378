"""DSpark speculative decoding for Hugging Face transformers."""
