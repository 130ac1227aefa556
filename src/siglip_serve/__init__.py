"""siglip-serve: SigLIP embeddings served with Ray Serve on Trainium2, GPU or CPU.

Packages, each knowing only its row of the architecture (tools/import_cycles.py keeps them acyclic):
core (torch-free constants and errors) <- models (towers, backends, compile) <- serve (the Ray Serve
application) <- launcher (`run`, `trn2-check`) and bulk (`embed`) <- measure (`bench`, `report`),
loadtest, kernels. `python -m siglip_serve` (the `siglip-serve` command) dispatches to each."""
