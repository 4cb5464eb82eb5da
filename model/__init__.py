"""Pure nn.Module code for Llama with configurable RMSNorm scale vectors; imports nothing from training."""
