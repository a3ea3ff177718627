"""The model: layers, blocks, whole models, initialization, the fast path and the peer model, parameter counting,
and Hugging Face configs. The block reviewer of document 004, which reads models, is its own package, blocklab.review."""
