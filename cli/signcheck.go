package cli

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/keel-dev/keel/sync"
)

func (e *env) signCheckCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "sign-check",
		Short: "Check a commit's signature the way an agent with --verify-signatures does",
		Long: `Sign-check verifies that a commit of the cluster repository carries an SSH
signature (git commit -S with gpg.format=ssh) in namespace "git", made by a
key of the allowed_signers file listed for a principal matching the
committer's email, or an OpenPGP signature by a key of the keyring with a
user ID of the committer's email. Use it in CI, or when setting up signing.

Exit status: 0 trusted, 1 not trusted (the reason is printed), 2 usage or
I/O error.`,
		Example: "  keel sign-check --allowed-signers /usr/local/etc/keel/allowed_signers --rev origin/main",
		Args:    cobra.NoArgs,
	}
	repo := repoFlag(cmd)
	rev := cmd.Flags().String("rev", "HEAD", "the revision to check")
	signersFile := cmd.Flags().String("allowed-signers", "", "OpenSSH allowed_signers file (SSH signatures)")
	keyring := cmd.Flags().String("pgp-keyring", "", "ASCII-armored OpenPGP public keyring (OpenPGP signatures)")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		signers, err := sync.LoadSigners(*signersFile, *keyring)
		if err != nil {
			return err
		}
		r, err := sync.OpenRepo(*repo)
		if err != nil {
			return err
		}
		c, err := sync.ResolveCommit(r, *rev)
		if err != nil {
			return err
		}
		principal, err := signers.Verify(c)
		if err != nil {
			fmt.Fprintf(e.stdout, "%s: not trusted: %v\n", c.Hash, err)
			return invalid(nil)
		}
		fmt.Fprintf(e.stdout, "%s: signed by %s (an allowed signer)\n", c.Hash, principal)
		return nil
	}
	return cmd
}
