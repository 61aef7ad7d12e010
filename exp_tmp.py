import time
from experiments.incidents_links import run_links
from experiments.incidents import lengths
from simsched import SimConfig
t=time.time()
runs, tl, times = run_links(SimConfig().replace(workload=lengths()), True)
import pandas as pd
pd.set_option("display.width", 250); pd.set_option("display.max_columns", 20)
print(runs); print(times); print(time.time()-t)
print(tl[tl.scenario=="link down, retry"])
