"""The two layers the Hopper kernels are tuned and timed on, as (H, I, E, top-k); benchmarks/moe_bench.py names the
same two."""

DSV3 = (7168, 2048, 256, 8)
K3 = (3584, 384, 896, 16)
SHAPES = {"dsv3": DSV3, "k3": K3}
