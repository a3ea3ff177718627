"""`blocklab bench`: throughput of the copy-task sweep: the plain loop, a peer-style model, the fast path, bf16.

Every lane trains the sweep's own runs (norm x warm-up x seed) with ``train.train`` for a few steps. They run in
interleaved rounds so that whatever else loads the machine slows all alike, and every number is reported next to
the fp32 matmul throughput measured in the same run:

    plain  one process, default torch threads, eager, the runs one after another (what a plain loop does)
    plain-WxT  the plain model in the fast lane's process layout: separates layout from kernels
    peer   the same model written as public GPT code is (blocklab.model.peer: fused qkv Linear, SDPA is_causal,
           nn.LayerNorm, fused Adam), in the fast lane's process layout: what a careful user would write
    fast   W worker processes x T threads, each run afresh (dynamo reset, as a new pipeline job would), with
           FusedLayerNorm, ShortCausalAttention, fused Adam, a tuned allocator and optionally torch.compile
    bf16   the fast lane under bf16 autocast (sweep.precision: bf16), where the device has bf16 units
    diagnostics  the fast lane recording the training-time diagnostics (params' ``diagnostics``): their overhead

Every speed-up is quoted against the fastest baseline (plain, plain-WxT, peer) in the same metric, never against a
slower one; bf16 also against the fp32 fast lane; the diagnostics lane's overhead against the fast lane.

The modules, bottom to top: ``flops`` (the work of a step: its FLOPs, its matrix products alone, the matmul peak),
``lanes`` (what is timed: the lanes and one run's training), ``workers`` (the worker processes and their protocol),
``report`` (measurements -> ratios and the printed table), ``run`` (the coordinator: interleaved rounds), ``command``
(the ``blocklab bench`` command line).
"""
