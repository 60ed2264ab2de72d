"""The Compare view: A against B on the same tokens; summary and curves (`charts`), per-token divergence
(`tokens`), the same head in both (`heads`), put together in `view`. May import records, data and views.common."""
