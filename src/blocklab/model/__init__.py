"""The model: layers, blocks, whole models, initialization, the fast path and the peer model, parameter counting,
Hugging Face configs, and the block reviewer of document 004."""
