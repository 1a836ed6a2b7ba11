"""What a step costs on a device: operator time sources, the step recipe, memory. No torch."""
