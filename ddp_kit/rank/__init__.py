"""What runs below the kernel: the agent (torchrun that dies with the kernel), the runner (every
rank's bootstrap), the server (a live rank's loop), and the fast start's fork server and relay.
Never imports ddp_kit.kernel."""
