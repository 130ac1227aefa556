"""The Ray Serve application (app.py composes it), in rooms, lowest first (tools/layers.py has their rows):

- http/: the HTTP contract (docs/http-api.md): its requests, answers, errors and OpenAPI document; no Ray.
- shared/: what the ingress and the towers' replicas share across a Serve handle: the registry (replicas
  publish, the ingress reads), metrics, traces, the batcher, a replica process's logging and gRPC bind.
- plan/: what a configuration becomes before anything runs: the config, the plan, every count, thread,
  limit and placement (plan/planner.py), the cluster check.
- towers/: the image and text towers' deployments and their replicas.
- ingress/: the ingress's deployment and everything its replicas run: the front door, the routes, the one
  scheduling call, decoding, URL fetches, the embedding cache, the links to the towers. It imports nothing
  of towers/: it reaches them through Serve handles and the registry.
"""
