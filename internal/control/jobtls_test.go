package control

import (
	"bytes"
	"crypto/tls"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	pb "github.com/titan-go/titan/internal/control/controlpb"
)

func jobServerTLS(secret, job string) *tls.Config {
	s, _, err := JobTLS(secret, job)
	if err != nil {
		panic(err)
	}
	return s
}

func jobClientTLS(t *testing.T, secret, job string) *tls.Config {
	t.Helper()
	_, c, err := JobTLS(secret, job)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestJobTLSDerivation(t *testing.T) {
	a1, _, err := JobTLS("secret-a", "job")
	if err != nil {
		t.Fatal(err)
	}
	a2, _, _ := JobTLS("secret-a", "job")
	b, _, _ := JobTLS("secret-b", "job")
	c, _, _ := JobTLS("secret-a", "job-2")
	der := func(c *tls.Config) []byte { return c.Certificates[0].Certificate[0] }
	if !bytes.Equal(der(a1), der(a2)) {
		t.Error("the same secret and job id derived two different certificates")
	}
	if bytes.Equal(der(a1), der(b)) || bytes.Equal(der(a1), der(c)) {
		t.Error("another secret or job id derived the same certificate")
	}
	if _, _, err := JobTLS("", "job"); err == nil {
		t.Error("JobTLS without a secret succeeded")
	}
}

// TestJobTLS runs a server on every interface (not loopback, so TLS is
// required) with the certificate derived from the job secret, and dials it
// with clients holding the right, a wrong or a stale secret, a wrong job id,
// or no TLS.
func TestJobTLS(t *testing.T) {
	const secret, stale = "the-job-secret-0123456789", "the-secret-of-an-earlier-job"
	s := startServer(t, ServerConfig{Addr: ":0", Secret: secret, TLS: jobServerTLS(secret, testJob)})
	_, port, _ := net.SplitHostPort(s.Addr())
	ep := net.JoinHostPort("127.0.0.1", port)
	ctx := testCtx(t)

	c, err := Dial(ctx, DialConfig{Endpoint: ep, JobID: testJob, Secret: secret, TLS: jobClientTLS(t, secret, testJob), Timeout: 5 * time.Second})
	if err != nil {
		t.Fatalf("Dial with the job secret: %v", err)
	}
	if err := c.Set(ctx, "k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	c.Close()

	tests := []struct {
		name        string
		job, secret string
		tls         *tls.Config
		timeout     time.Duration
		is          error
		msg         string
	}{
		{"wrong secret", testJob, "guess", jobClientTLS(t, "guess", testJob), 5 * time.Second, ErrNotJobServer, "not the one derived"},
		{"stale secret", testJob, stale, jobClientTLS(t, stale, testJob), 5 * time.Second, ErrNotJobServer, "not the one derived"},
		{"wrong job id", "other-job", secret, jobClientTLS(t, secret, "other-job"), 5 * time.Second, ErrNotJobServer, "not the one derived"},
		{"plain text", testJob, secret, nil, 500 * time.Millisecond, nil, "could not reach"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			c, err := Dial(ctx, DialConfig{Endpoint: ep, JobID: tc.job, Secret: tc.secret, TLS: tc.tls, Timeout: tc.timeout})
			if err == nil {
				c.Close()
				t.Fatal("Dial succeeded")
			}
			if (tc.is != nil && !errors.Is(err, tc.is)) || !strings.Contains(err.Error(), tc.msg) || !strings.Contains(err.Error(), ep) {
				t.Fatalf("Dial: %v, want an error naming %s and containing %q", err, ep, tc.msg)
			}
			if tc.is != nil && time.Since(start) > 3*time.Second {
				t.Errorf("a refused certificate took %v to fail; want it at once", time.Since(start))
			}
			if strings.Contains(err.Error(), secret) {
				t.Errorf("the error shows the job secret: %v", err)
			}
		})
	}

	// A caller that skips the certificate check reaches the server, but
	// without the secret gets the one refusal, whatever it presents.
	raw, err := grpc.NewClient(ep, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{InsecureSkipVerify: true})))
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	rpc := pb.NewControlClient(raw)
	var msgs []string
	for _, kv := range [][]string{
		{MetadataJobID, testJob, MetadataSecret, stale},
		{MetadataJobID, "other-job", MetadataSecret, secret},
		{MetadataJobID, "other-job", MetadataSecret, stale},
	} {
		_, err := rpc.Ping(metadata.AppendToOutgoingContext(ctx, kv...), &pb.PingRequest{})
		if status.Code(err) != codes.Unauthenticated {
			t.Fatalf("Ping with %v: %v, want Unauthenticated", kv, err)
		}
		msgs = append(msgs, status.Convert(err).Message())
	}
	for _, m := range msgs {
		if m != NotAdmitted {
			t.Errorf("refusals %q, want all %q", msgs, NotAdmitted)
		}
	}
	resp, err := rpc.Ping(metadata.AppendToOutgoingContext(ctx, MetadataJobID, testJob, MetadataSecret, secret), &pb.PingRequest{})
	if err != nil || resp.JobId != testJob {
		t.Fatalf("Ping with the secret over TLS: %v, %v", resp, err)
	}
}
