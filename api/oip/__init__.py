"""The Open Inference Protocol (KServe v2) front: /v2 REST and GRPCInferenceService, translated
to TF Serving's Predict and GetModelMetadata through the serving client."""
