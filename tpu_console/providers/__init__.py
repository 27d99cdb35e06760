"""Where nodes come from: gcp (Cloud TPU API), local (embedded pod simulator), ssh (hosts you list)."""
