def check_plot_dir(d): pass
def sweep_plots(rows, d, name): return []
