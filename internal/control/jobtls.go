package control

import (
	"crypto/ed25519"
	"crypto/hkdf"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"math/big"
	"time"
)

// ErrNotJobServer is matched (errors.Is) by the error of a client whose
// server did not present the certificate derived from the job secret and
// job id the client holds: a wrong secret or job id on the client, or
// another job's server on the port.
var ErrNotJobServer = errors.New("the control server does not hold this job's secret")

// JobTLS returns TLS configurations for a control plane whose only
// credential is the job secret: the server presents a self-signed
// certificate for an Ed25519 key derived from secret and jobID, and
// clients accept exactly that key, not a certificate authority's word. Only
// a holder of the secret can then serve the job or read its traffic, and a
// client never sends its secret to a server that does not hold it.
//
// The key is ed25519.NewKeyFromSeed of HKDF-SHA256(secret, info = label ||
// jobID), so every process of a job derives the same one without talking
// to the others. The public key is seen by anyone who connects; it reveals
// nothing of a random secret, but a guessable secret can be found from it
// by trying candidates, so the secret must be random (at least 128 bits).
func JobTLS(secret, jobID string) (server, client *tls.Config, err error) {
	if secret == "" {
		return nil, nil, errors.New("control: a TLS certificate derived from the job secret needs a secret")
	}
	seed, err := hkdf.Key(sha256.New, []byte(secret), nil, "titan control-plane TLS key v1\x00"+jobID, ed25519.SeedSize)
	if err != nil {
		return nil, nil, fmt.Errorf("control: deriving the job's TLS key: %w", err)
	}
	key := ed25519.NewKeyFromSeed(seed)
	pub := key.Public().(ed25519.PublicKey)
	// Fixed fields: the certificate is the same in every process (Ed25519
	// signatures are deterministic). Clients check the key, not the dates.
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "titan job control plane"},
		NotBefore:             time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC),
		NotAfter:              time.Date(2100, 1, 1, 0, 0, 0, 0, time.UTC),
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(nil, tmpl, tmpl, pub, key)
	if err != nil {
		return nil, nil, fmt.Errorf("control: making the job's TLS certificate: %w", err)
	}
	server = &tls.Config{
		Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}},
		MinVersion:   tls.VersionTLS13,
	}
	client = &tls.Config{
		MinVersion: tls.VersionTLS13,
		// The server is authenticated by the pinned key below, not by a
		// chain to a root: there is none.
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return ErrNotJobServer
			}
			got, ok := cs.PeerCertificates[0].PublicKey.(ed25519.PublicKey)
			if !ok || !got.Equal(pub) {
				return fmt.Errorf("%w (its certificate is not the one derived from this process's job secret and job id: a wrong secret or job id here, or another job's server on this port)", ErrNotJobServer)
			}
			return nil
		},
	}
	return server, client, nil
}
