"""Training backends behind one interface (`slime.train.base.TrainBackend`), chosen by parallelism.backend."""
