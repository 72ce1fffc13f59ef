"""Task 2 zero-shot adapters: text side (description bank, encoders, cached class embeddings), the semantic and
open_clip adapters, the leak guard, proxy-OOD validation and the unseen-class report."""
