"""The kernel-ready format that ``convert`` writes and everything else reads: the manifest, its checks, the shard
names. Below ``checkpoint.summary``, ``convert``, the runtime and the vLLM plugin, which import it; it imports only
the checkpoint readers' JSON and file helpers."""
