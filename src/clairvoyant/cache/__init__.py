"""MECHANISM: node-local tiers, atomic publish, locks."""
