"""Settings of kiln's AOT autograd (module attributes; change them at runtime).

``partition_fn``: the partitioner stage 2 uses when none is given: ``"default"`` (save what the
backward reads), ``"min_cut"`` (recompute cheap ops instead of saving them) or a callable
``(joint_module, joint_inputs, *, num_fwd_outputs) -> (fw_module, bw_module)``.
"""
partition_fn = "default"
