"""Cloud adapters: the worlds behind the Fleet and Serverless ports."""
