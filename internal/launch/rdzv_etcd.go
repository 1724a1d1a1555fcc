package launch

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// etcdStore is the etcd backend of the rendezvous: an etcd v3 cluster
// holds the rendezvous state, so that it survives the loss of any
// training node. Membership is a key per node bound to a lease that the
// node's launcher keeps alive.
type etcdStore struct {
	cli *clientv3.Client
}

// openEtcd connects to the etcd cluster at endpoints (comma-separated
// host:port list) and checks that it answers within timeout.
func openEtcd(endpoints string, timeout time.Duration) (*etcdStore, error) {
	var eps []string
	for _, e := range strings.Split(endpoints, ",") {
		if e = strings.TrimSpace(e); e != "" {
			eps = append(eps, e)
		}
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: eps, DialTimeout: timeout, Logger: zap.NewNop()})
	if err != nil {
		return nil, fmt.Errorf("etcd rendezvous at %s: %w", endpoints, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if _, err := cli.Get(ctx, "titan-rdzv-ping"); err != nil {
		cli.Close()
		return nil, fmt.Errorf("etcd rendezvous at %s does not answer within %v: %w", endpoints, timeout, err)
	}
	return &etcdStore{cli: cli}, nil
}

func (s *etcdStore) Grant(ctx context.Context, ttl time.Duration) (int64, error) {
	secs := int64(math.Ceil(ttl.Seconds()))
	r, err := s.cli.Grant(ctx, max(secs, 2)) // etcd's shortest TTL is about 2 s
	if err != nil {
		return 0, fmt.Errorf("etcd: granting a lease: %w", err)
	}
	return int64(r.ID), nil
}

func (s *etcdStore) KeepAlive(ctx context.Context, lease int64) error {
	_, err := s.cli.KeepAliveOnce(ctx, clientv3.LeaseID(lease))
	if errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return errLeaseGone
	}
	return err
}

func (s *etcdStore) Revoke(ctx context.Context, lease int64) error {
	_, err := s.cli.Revoke(ctx, clientv3.LeaseID(lease))
	if errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return nil
	}
	return err
}

func (s *etcdStore) Create(ctx context.Context, key, value string, lease int64) (bool, error) {
	var opts []clientv3.OpOption
	if lease != 0 {
		opts = append(opts, clientv3.WithLease(clientv3.LeaseID(lease)))
	}
	r, err := s.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, value, opts...)).Commit()
	if errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return false, errLeaseGone
	}
	if err != nil {
		return false, fmt.Errorf("etcd: creating %s: %w", key, err)
	}
	return r.Succeeded, nil
}

func (s *etcdStore) Swap(ctx context.Context, key, old, value string) (bool, error) {
	cmp := clientv3.Compare(clientv3.Value(key), "=", old)
	if old == "" {
		cmp = clientv3.Compare(clientv3.CreateRevision(key), "=", 0)
	}
	r, err := s.cli.Txn(ctx).If(cmp).Then(clientv3.OpPut(key, value)).Commit()
	if err != nil {
		return false, fmt.Errorf("etcd: updating %s: %w", key, err)
	}
	return r.Succeeded, nil
}

func (s *etcdStore) List(ctx context.Context, prefix string) (map[string]string, int64, error) {
	r, err := s.cli.Get(ctx, prefix, clientv3.WithPrefix())
	if err != nil {
		return nil, 0, fmt.Errorf("etcd: listing %s: %w", prefix, err)
	}
	out := make(map[string]string, len(r.Kvs))
	for _, kv := range r.Kvs {
		out[string(kv.Key)] = string(kv.Value)
	}
	return out, r.Header.Revision, nil
}

func (s *etcdStore) Wait(ctx context.Context, prefix string, rev int64) error {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	for r := range s.cli.Watch(wctx, prefix, clientv3.WithPrefix(), clientv3.WithRev(rev+1)) {
		if err := r.Err(); err != nil {
			return fmt.Errorf("etcd: watching %s: %w", prefix, err)
		}
		if len(r.Events) > 0 {
			return nil
		}
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return fmt.Errorf("etcd: watching %s ended", prefix)
}

func (s *etcdStore) Close() error { return s.cli.Close() }
