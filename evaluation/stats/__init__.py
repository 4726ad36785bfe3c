"""Pure statistics: no Django and none of our apps, so every layer may import them."""
