"""What ran: the run store, runs found on pods, records that outlive a node, archives, summaries and
goodput."""
