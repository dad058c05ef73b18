"""Image builds: the Dockerfile and context from a job spec (pure), and the engine build and push."""
