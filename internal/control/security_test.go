package control

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	pb "github.com/titan-go/titan/internal/control/controlpb"
)

func tlsConfigWithoutCert() *tls.Config { return &tls.Config{} }

func TestWrongSecret(t *testing.T) {
	s := startServer(t, ServerConfig{})
	_, err := Dial(context.Background(), DialConfig{Endpoint: s.Addr(), JobID: testJob, Secret: "guess", Timeout: 5 * time.Second})
	if err == nil {
		t.Fatal("Dial with a wrong secret succeeded")
	}
	if !errors.Is(err, ErrNotAdmitted) || status.Code(err) != codes.Unauthenticated || !strings.Contains(err.Error(), "not admitted") {
		t.Fatalf("Dial with wrong secret: %v", err)
	}
	if _, err := Dial(context.Background(), DialConfig{Endpoint: s.Addr(), JobID: testJob, Timeout: 5 * time.Second}); !errors.Is(err, ErrNotAdmitted) {
		t.Fatalf("Dial without a secret: %v", err)
	}
}

func TestEveryCallIsAuthenticated(t *testing.T) {
	// A raw gRPC client (not Dial, so no Ping first) calling store and
	// rendezvous methods with wrong or missing credentials is refused.
	s := startServer(t, ServerConfig{WorldSize: 2})
	conn, err := grpc.NewClient(s.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	raw := pb.NewControlClient(conn)
	ctx := testCtx(t)
	calls := map[string]func(context.Context) error{
		"Join": func(ctx context.Context) error {
			_, err := raw.Join(ctx, &pb.JoinRequest{LocalWorldSize: 2})
			return err
		},
		"Set": func(ctx context.Context) error {
			_, err := raw.Set(ctx, &pb.SetRequest{Key: "k", Value: []byte("v")})
			return err
		},
		"Get": func(ctx context.Context) error {
			_, err := raw.Get(ctx, &pb.GetRequest{Key: "k"})
			return err
		},
		"Heartbeat": func(ctx context.Context) error {
			_, err := raw.Heartbeat(ctx, &pb.HeartbeatRequest{})
			return err
		},
		"ReportExit": func(ctx context.Context) error {
			_, err := raw.ReportExit(ctx, &pb.ReportExitRequest{})
			return err
		},
	}
	creds := map[string][]string{
		"none":         {MetadataJobID, testJob},
		"wrong":        {MetadataJobID, testJob, MetadataSecret, "s3cre"},
		"longer":       {MetadataJobID, testJob, MetadataSecret, testSecret + "x"},
		"wrong job id": {MetadataJobID, "other", MetadataSecret, testSecret},
	}
	creds["no metadata"] = nil
	creds["wrong job id and secret"] = []string{MetadataJobID, "other", MetadataSecret, "guess"}
	creds["job id prefix"] = []string{MetadataJobID, testJob[:3], MetadataSecret, testSecret}
	// Every refusal is the same: one code, one message, naming nothing.
	for cname, kv := range creds {
		for name, call := range calls {
			err := call(metadata.AppendToOutgoingContext(ctx, kv...))
			st := status.Convert(err)
			if st.Code() != codes.Unauthenticated || st.Message() != NotAdmitted || len(st.Details()) != 0 {
				t.Errorf("%s with %s credentials: %v, want Unauthenticated %q and nothing else", name, cname, err, NotAdmitted)
			}
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.members) != 0 || len(s.kv) != 0 || len(s.exited) != 0 || len(s.lastBeat) != 0 {
		t.Fatal("a refused call changed the server state")
	}
}

func TestWrongJobID(t *testing.T) {
	s := startServer(t, ServerConfig{JobID: "job-a"})
	_, err := Dial(context.Background(), DialConfig{Endpoint: s.Addr(), JobID: "job-b", Secret: testSecret, Timeout: 5 * time.Second})
	if !errors.Is(err, ErrNotAdmitted) || status.Code(err) != codes.Unauthenticated || strings.Contains(err.Error(), "job-a") {
		t.Fatalf("Dial with wrong job id: %v, want %q that does not name the server's job", err, NotAdmitted)
	}
}

// testPKI is a throw-away CA with a server and a client certificate, written
// as PEM files.
type testPKI struct {
	dir                                string
	caFile, serverCert, serverKey      string
	clientCert, clientKey, otherCAFile string
	caCert                             *x509.Certificate
	caKey                              *ecdsa.PrivateKey
}

func newTestPKI(t *testing.T) *testPKI {
	t.Helper()
	p := &testPKI{dir: t.TempDir()}
	p.caCert, p.caKey, p.caFile = p.newCA(t, "ca")
	_, _, p.otherCAFile = p.newCA(t, "other-ca")
	p.serverCert, p.serverKey = p.issue(t, "server", x509.ExtKeyUsageServerAuth)
	p.clientCert, p.clientKey = p.issue(t, "client", x509.ExtKeyUsageClientAuth)
	return p
}

func (p *testPKI) newCA(t *testing.T, name string) (*x509.Certificate, *ecdsa.PrivateKey, string) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "titan test " + name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(p.dir, name+".pem")
	writePEM(t, file, "CERTIFICATE", der)
	return cert, key, file
}

func (p *testPKI) issue(t *testing.T, name string, usage x509.ExtKeyUsage) (certFile, keyFile string) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: "titan test " + name},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{usage},
		DNSNames:     []string{"localhost"},
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.caCert, &key.PublicKey, p.caKey)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile = filepath.Join(p.dir, name+".crt")
	keyFile = filepath.Join(p.dir, name+".key")
	writePEM(t, certFile, "CERTIFICATE", der)
	writePEM(t, keyFile, "EC PRIVATE KEY", kder)
	return certFile, keyFile
}

func writePEM(t *testing.T, file, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(file, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestTLS(t *testing.T) {
	p := newTestPKI(t)
	serverTLS, err := LoadServerTLS(p.serverCert, p.serverKey, "")
	if err != nil {
		t.Fatal(err)
	}
	s := startServer(t, ServerConfig{TLS: serverTLS})
	ctx := testCtx(t)

	tests := []struct {
		name    string
		client  func() (*tls.Config, error)
		timeout time.Duration
		msg     string // empty: must work
	}{
		{"trusted CA", func() (*tls.Config, error) { return LoadClientTLS(p.caFile, "", "") }, 5 * time.Second, ""},
		{"other CA", func() (*tls.Config, error) { return LoadClientTLS(p.otherCAFile, "", "") }, 5 * time.Second, "certificate signed by unknown authority"},
		{"no CA (system roots)", func() (*tls.Config, error) { return LoadClientTLS("", "", "") }, 5 * time.Second, "TLS handshake failed"},
		{"plain text client", func() (*tls.Config, error) { return nil, nil }, 500 * time.Millisecond, "could not reach"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			clientTLS, err := tc.client()
			if err != nil {
				t.Fatal(err)
			}
			c, err := Dial(ctx, DialConfig{Endpoint: s.Addr(), JobID: testJob, Secret: testSecret, TLS: clientTLS, Timeout: tc.timeout})
			if tc.msg != "" {
				if err == nil {
					c.Close()
					t.Fatalf("Dial succeeded, want error containing %q", tc.msg)
				}
				if !strings.Contains(err.Error(), tc.msg) || !strings.Contains(err.Error(), s.Addr()) {
					t.Fatalf("Dial: %v, want error naming %s and containing %q", err, s.Addr(), tc.msg)
				}
				return
			}
			if err != nil {
				t.Fatalf("Dial: %v", err)
			}
			defer c.Close()
			if err := c.Set(ctx, "tls", []byte("ok")); err != nil {
				t.Fatal(err)
			}
			if v, err := c.Get(ctx, "tls"); err != nil || string(v) != "ok" {
				t.Fatalf("Get over TLS = %q, %v", v, err)
			}
		})
	}
}

func TestMutualTLS(t *testing.T) {
	p := newTestPKI(t)
	serverTLS, err := LoadServerTLS(p.serverCert, p.serverKey, p.caFile)
	if err != nil {
		t.Fatal(err)
	}
	s := startServer(t, ServerConfig{TLS: serverTLS})
	ctx := testCtx(t)

	withCert, err := LoadClientTLS(p.caFile, p.clientCert, p.clientKey)
	if err != nil {
		t.Fatal(err)
	}
	c, err := Dial(ctx, DialConfig{Endpoint: s.Addr(), JobID: testJob, Secret: testSecret, TLS: withCert, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatalf("Dial with client certificate: %v", err)
	}
	defer c.Close()
	if _, err := c.Add(ctx, "n", 1); err != nil {
		t.Fatal(err)
	}

	// Without a client certificate the server ends the handshake. With TLS
	// 1.3 the client learns it only on its first read, so the failure may
	// show as a handshake error or as a server that cannot be reached.
	noCert, err := LoadClientTLS(p.caFile, "", "")
	if err != nil {
		t.Fatal(err)
	}
	c2, err := Dial(ctx, DialConfig{Endpoint: s.Addr(), JobID: testJob, Secret: testSecret, TLS: noCert, Timeout: time.Second})
	if err == nil {
		c2.Close()
		t.Fatal("Dial without a client certificate succeeded")
	}
	if !strings.Contains(err.Error(), s.Addr()) {
		t.Fatalf("Dial without client certificate: %v, want error naming %s", err, s.Addr())
	}
	t.Logf("without client certificate: %v", err)
}

func TestLoadTLSErrors(t *testing.T) {
	p := newTestPKI(t)
	notPEM := filepath.Join(p.dir, "junk.pem")
	if err := os.WriteFile(notPEM, []byte("junk"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		load func() (*tls.Config, error)
		msg  string
	}{
		{"server without key", func() (*tls.Config, error) { return LoadServerTLS(p.serverCert, "", "") }, "both a certificate file and a key file"},
		{"server missing cert", func() (*tls.Config, error) {
			return LoadServerTLS(filepath.Join(p.dir, "missing.crt"), p.serverKey, "")
		}, "missing.crt"},
		{"server junk CA", func() (*tls.Config, error) { return LoadServerTLS(p.serverCert, p.serverKey, notPEM) }, "holds no PEM certificate"},
		{"client cert without key", func() (*tls.Config, error) { return LoadClientTLS(p.caFile, p.clientCert, "") }, "both a certificate file and a key file"},
		{"client missing CA", func() (*tls.Config, error) { return LoadClientTLS(filepath.Join(p.dir, "nope.pem"), "", "") }, "nope.pem"},
		{"client mismatched key", func() (*tls.Config, error) { return LoadClientTLS(p.caFile, p.clientCert, p.serverKey) }, "client.crt"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := tc.load()
			if err == nil || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("error %v, want one containing %q", err, tc.msg)
			}
		})
	}
}
