"""What the stages share, torch-free: the manifest and its signature, the tokenizer's settings, how an image becomes
the model's input, and the one client error. The trainer, the exporter and the service import it; the Bento
includes it whole (bentofile.yaml), so a served model needs nothing else of export/ or train/."""
