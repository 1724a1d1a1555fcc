package launch

import (
	"github.com/titan-go/titan/internal/livemetrics"
)

// observability starts the live metrics endpoint (Spec.MetricsAddr, on
// node rank 0, where rank 0 runs) and asks the workers for pprof
// (Spec.Pprof), returning the workers' base environment with the
// variables that tell them so, and a function that stops the endpoint.
func (l *launcher) observability(base []string, jobID string) ([]string, func(), error) {
	stop := func() {}
	if l.spec.Pprof {
		base = append(base, livemetrics.EnvPprof+"=127.0.0.1:0")
	}
	if l.spec.MetricsAddr == "" || l.spec.NodeRank != 0 {
		return base, stop, nil
	}
	srv, err := livemetrics.StartServer(l.spec.MetricsAddr, jobID, l.spec.MetricsPublic)
	if err != nil {
		return nil, nil, err
	}
	l.logf("job %s: live metrics on http://%s/metrics", jobID, srv.Addr)
	return append(base, livemetrics.EnvFile+"="+srv.File), func() { srv.Close() }, nil
}
