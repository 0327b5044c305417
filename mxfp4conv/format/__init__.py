"""The kernel-ready format that ``convert`` writes and everything else reads: the manifest (its fields, checks,
reading and the shard names) and the activations it names with their parameters. Below ``checkpoint.summary``,
``convert``, the kernels, the runtime and the vLLM plugin, which import it; it imports only the checkpoint readers'
JSON and file helpers."""
