"""The shipped gin configs, a package so that gin finds their includes
('gin_configs/base.gin') on the Python path from any directory."""
