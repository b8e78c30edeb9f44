"""The inbox's pages: views, the other inbox actions (claims, bulk, one item), cards, forms."""
