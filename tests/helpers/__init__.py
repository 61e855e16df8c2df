"""What tests share, beside the cluster they run on (testbed/): object factories, cluster and
install helpers, the chart renderer, the fault proxy, generated-input runners, the
webhook client, the browser check."""
