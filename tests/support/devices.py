"""The XLA flag that gives the JAX tests 8 fake CPU devices (read once, when jax is first imported)."""

JAX_DEVICES_FLAG = "--xla_force_host_platform_device_count=8"
