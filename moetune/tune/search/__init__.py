"""Which configs to time: the search space and its pruning, the cost model, the strategies
(whole call and SGLang's up/down split)."""
