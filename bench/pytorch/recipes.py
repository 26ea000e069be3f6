"""The training recipes that mnist_mt's --recipe names, and the defaults of its optimizer
and schedule flags, as recipe.py and bench/time_to_accuracy.py read them (no torch here)."""

# What each --recipe sets, as mnist_mt's --recipe does (src/cli/recipes.cpp); flags given on
# the command line override it. A recipe's batch is the global batch, shared out between the
# ranks, unless batch_per_rank says it is each rank's (--batch-size itself is per rank).
RECIPES = {
    # PyTorch's examples/mnist/main.py.
    "pytorch-example": {"optimizer": "adadelta", "lr": 1.0, "lr_schedule": "step", "lr_step": 1,
                        "gamma": 0.7, "batch_size": 64, "epochs": 14},
    # The DistributedDataParallel template that mnist_mt replaces (demo.py).
    "template": {"optimizer": "sgd", "lr": 1e-3, "batch_size": 4, "batch_per_rank": True},
    # The least training found to reach 99.0% mean test accuracy over 5 seeds for this
    # network (docs/benchmarks.md, "Time to accuracy"): 2 epochs stay near 98.9%.
    "fast": {"optimizer": "adamw", "lr": 3e-3, "lr_schedule": "onecycle", "batch_size": 128, "epochs": 3},
}

# With neither a recipe nor the flag: mnist_mt's defaults, and torch.optim's per optimizer.
DEFAULTS = {"optimizer": "sgd", "momentum": 0.0, "nesterov": False, "betas": (0.9, 0.999), "rho": 0.9,
            "lr_schedule": "constant", "lr_step": 1, "gamma": 0.1, "warmup": 0, "batch_size": 64,
            "epochs": 1, "seed": 1}
OPTIMIZER_DEFAULTS = {"sgd": {"lr": 0.01, "weight_decay": 0.0, "eps": 0.0},
                      "adam": {"lr": 1e-3, "weight_decay": 0.0, "eps": 1e-8},
                      "adamw": {"lr": 1e-3, "weight_decay": 0.01, "eps": 1e-8},
                      "adadelta": {"lr": 1.0, "weight_decay": 0.0, "eps": 1e-6}}
