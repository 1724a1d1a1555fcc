package launch

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
)

// EnvSecretFile names a file that holds the job secret, as
// --rdzv-secret-file does.
const EnvSecretFile = "TITANRUN_SECRET_FILE"

const (
	// MinSecretLen is the length a job secret given by the user must
	// have at least. The control plane's certificate and the data plane's
	// challenges are derived from the secret, so anyone who connects could
	// test guesses of a short one offline.
	MinSecretLen = 16
	// maxSecretFile bounds what is read of a secret file.
	maxSecretFile = 4096
)

// userSecret returns the job secret the user gave, and where it came from
// (for messages; never the secret itself): the file of --rdzv-secret-file
// (flagFile) or of TITANRUN_SECRET_FILE, or TITANRUN_SECRET. At most one
// may be set. It returns "", "" when none is.
func userSecret(env map[string]string, flagFile string) (secret, source string, err error) {
	var given []string
	if flagFile != "" {
		given = append(given, "--rdzv-secret-file")
	}
	if env[EnvSecretFile] != "" {
		given = append(given, EnvSecretFile)
	}
	if env[EnvSecret] != "" {
		given = append(given, EnvSecret)
	}
	switch {
	case len(given) > 1:
		return "", "", fmt.Errorf("the job secret is given twice (%s): give one", strings.Join(given, " and "))
	case len(given) == 0:
		return "", "", nil
	case flagFile != "":
		secret, err = ReadSecretFile(flagFile)
		return secret, "--rdzv-secret-file " + flagFile, err
	case env[EnvSecretFile] != "":
		secret, err = ReadSecretFile(env[EnvSecretFile])
		return secret, EnvSecretFile + "=" + env[EnvSecretFile], err
	}
	secret = env[EnvSecret]
	if err := checkSecret(secret); err != nil {
		return "", "", fmt.Errorf("%s: %w", EnvSecret, err)
	}
	return secret, EnvSecret, nil
}

// checkSecret refuses a secret too short to be safe; the message never
// shows the secret.
func checkSecret(secret string) error {
	if len(secret) < MinSecretLen {
		return fmt.Errorf("the job secret has %d characters; it must have at least %d random ones (e.g. `openssl rand -hex 16`)", len(secret), MinSecretLen)
	}
	return nil
}

// ReadSecretFile reads a job secret from path: a regular file, readable and
// writable by its owner only (mode 0600 or 0400), holding the secret
// (surrounding white space is dropped). A file that group or others may
// read or write, an empty or too short one, or a large one is refused with
// an error naming the file; the error never shows the file's content.
func ReadSecretFile(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("job secret file: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return "", fmt.Errorf("job secret file: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return "", fmt.Errorf("job secret file %s is not a regular file", path)
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 && runtime.GOOS != "windows" {
		return "", fmt.Errorf("job secret file %s has mode %#o: group or others may read or change it, so it cannot keep the job's secret; run chmod 600 %s (and consider the secret known: make a new one)", path, perm, path)
	}
	b, err := io.ReadAll(io.LimitReader(f, maxSecretFile+1))
	if err != nil {
		return "", fmt.Errorf("job secret file %s: %w", path, err)
	}
	if len(b) > maxSecretFile {
		return "", fmt.Errorf("job secret file %s is larger than %d bytes; it should hold the secret alone", path, maxSecretFile)
	}
	secret := strings.TrimSpace(string(b))
	if secret == "" {
		return "", fmt.Errorf("job secret file %s is empty", path)
	}
	if err := checkSecret(secret); err != nil {
		return "", fmt.Errorf("job secret file %s: %w", path, err)
	}
	return secret, nil
}

// secretDir is the folder of generated secret files: $XDG_RUNTIME_DIR/titan
// (a per-user folder of the session), else titan/secrets in the user's
// cache folder; a variable for tests.
var secretDir = func() (string, error) {
	if d := os.Getenv("XDG_RUNTIME_DIR"); d != "" && filepath.IsAbs(d) {
		return filepath.Join(d, "titan"), nil
	}
	d, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("no folder for the generated job secret (%v); give one with --rdzv-secret-file", err)
	}
	return filepath.Join(d, "titan", "secrets"), nil
}

// writeSecretFile writes secret into a new file for job jobID in
// secretDir, readable by this user only, and returns its path. An older
// file of the same job is replaced: its secret is stale.
func writeSecretFile(jobID, secret string) (string, error) {
	dir, err := secretDir()
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("folder for the job secret: %w", err)
	}
	name := strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '.' || r == '_' {
			return r
		}
		return '_'
	}, jobID)
	path := filepath.Join(dir, name+".secret")
	f, err := os.CreateTemp(dir, ".secret-*") // mode 0600
	if err != nil {
		return "", fmt.Errorf("writing the job secret: %w", err)
	}
	_, err = f.WriteString(secret + "\n")
	if err == nil {
		err = f.Chmod(0o600)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		os.Remove(f.Name())
		return "", fmt.Errorf("writing the job secret to %s: %w", path, err)
	}
	return path, nil
}
