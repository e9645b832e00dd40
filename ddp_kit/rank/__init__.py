"""What torchrun starts: the agent (torchrun that dies with the kernel), the runner (every
rank's bootstrap) and the server (a live rank's loop). Never imports ddp_kit.kernel."""
