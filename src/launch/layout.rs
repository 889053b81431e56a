//! One node's share of a job: which ranks it runs, the variables each worker
//! gets (exactly torchrun's, plus the rendezvous token), and the token itself.

use crate::error::{Error, Result};

/// The ranks one node runs and where the job meets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodePlan {
    /// Number of nodes in the job.
    pub nnodes: usize,
    /// This node's index.
    pub node_rank: usize,
    /// Workers on this node.
    pub nproc: usize,
    /// Global rank of this node's local rank 0.
    pub rank_offset: usize,
    /// Workers in the whole job.
    pub world_size: usize,
    /// Rendezvous host.
    pub master_addr: String,
    /// Rendezvous port.
    pub master_port: u16,
    /// torchrun's run id (`--rdzv_id`, or "none").
    pub run_id: String,
    /// The job token every peer presents to the rendezvous store.
    pub token: String,
}

impl NodePlan {
    /// Checks that the node's ranks lie inside the job.
    pub fn validate(&self) -> Result<()> {
        if self.nproc == 0 {
            return Err(Error::config("--nproc_per_node", "expected at least 1 worker per node, found 0"));
        }
        if self.nnodes == 0 {
            return Err(Error::config("--nnodes", "expected at least 1 node, found 0"));
        }
        if self.node_rank >= self.nnodes {
            return Err(Error::config("--node_rank", format!("expected 0 <= node_rank < nnodes ({}), found {}", self.nnodes, self.node_rank)));
        }
        let end = self.rank_offset.checked_add(self.nproc).ok_or_else(|| {
            Error::config("--rank_offset", format!("expected a job that fits in this machine's integers, found ranks from {}", self.rank_offset))
        })?;
        if end > self.world_size {
            return Err(Error::config(
                "--world_size",
                format!("expected a world of at least {end} to hold the node's ranks {}..{}, found {}", self.rank_offset, end - 1, self.world_size),
            ));
        }
        Ok(())
    }

    /// The variables torchrun sets for local rank `local_rank`, and the token.
    pub fn worker_env(&self, local_rank: usize) -> Vec<(String, String)> {
        let rank = self.rank_offset + local_rank;
        let vars = [
            ("RANK", rank.to_string()),
            ("LOCAL_RANK", local_rank.to_string()),
            ("WORLD_SIZE", self.world_size.to_string()),
            ("LOCAL_WORLD_SIZE", self.nproc.to_string()),
            ("GROUP_RANK", self.node_rank.to_string()),
            ("GROUP_WORLD_SIZE", self.nnodes.to_string()),
            ("ROLE_RANK", rank.to_string()),
            ("ROLE_WORLD_SIZE", self.world_size.to_string()),
            ("ROLE_NAME", "default".to_string()),
            ("MASTER_ADDR", self.master_addr.clone()),
            ("MASTER_PORT", self.master_port.to_string()),
            ("TORCHELASTIC_RUN_ID", self.run_id.clone()),
            ("TORCHELASTIC_RESTART_COUNT", "0".to_string()),
            ("TORCHELASTIC_MAX_RESTARTS", "0".to_string()),
            ("ASRFORGE_RDZV_TOKEN", self.token.clone()),
        ];
        vars.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
    }
}

/// 16 random bytes from the kernel, in hex.
pub fn random_token() -> Result<String> {
    use std::io::Read;
    let mut bytes = [0u8; 16];
    std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut bytes)).map_err(|source| Error::Io { path: "/dev/urandom".into(), source })?;
    Ok(hex(&bytes))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A token every node computes alike from the rendezvous id: two 64-bit
/// FNV-1a hashes (different offsets) of `asrforge-rdzv:<id>`, in hex. It
/// keeps stray jobs apart; it is as secret as the id is.
pub fn token_from_rdzv_id(id: &str) -> String {
    let fnv = |basis: u64| {
        let mut h = basis;
        for b in b"asrforge-rdzv:".iter().chain(id.as_bytes()) {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        h
    };
    format!("{:016x}{:016x}", fnv(0xcbf2_9ce4_8422_2325), fnv(0x6c62_272e_07bb_0142))
}

/// The job token: `ASRFORGE_RDZV_TOKEN` when set; else, for a job whose
/// other nodes this launcher starts itself (one node, or a hostfile), a
/// fresh random one; else (several nodes, each started by hand) one derived
/// from `--rdzv_id`, or an error: the nodes could not agree on it.
pub fn job_token(from_env: Option<String>, nnodes: usize, starts_all_nodes: bool, rdzv_id: Option<&str>) -> Result<String> {
    if let Some(t) = from_env.filter(|t| !t.is_empty()) {
        return Ok(t);
    }
    if nnodes == 1 || starts_all_nodes {
        return random_token();
    }
    match rdzv_id {
        Some(id) => Ok(token_from_rdzv_id(id)),
        None => Err(Error::config(
            "ASRFORGE_RDZV_TOKEN",
            format!("a job on {nnodes} nodes needs one rendezvous token on every node, found neither ASRFORGE_RDZV_TOKEN nor --rdzv_id; set ASRFORGE_RDZV_TOKEN to the same value on every node (e.g. `export ASRFORGE_RDZV_TOKEN=$(head -c16 /dev/urandom | od -An -tx1 | tr -d ' \\n')`), or pass the same --rdzv_id to every node's launcher"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(node_rank: usize) -> NodePlan {
        NodePlan {
            nnodes: 2,
            node_rank,
            nproc: 3,
            rank_offset: 3 * node_rank,
            world_size: 6,
            master_addr: "h0".into(),
            master_port: 1234,
            run_id: "none".into(),
            token: "t".into(),
        }
    }

    #[test]
    fn worker_variables_follow_torchrun() {
        let env = plan(1).worker_env(2);
        let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        // rank = node_rank * nproc + local_rank = 1 * 3 + 2.
        assert_eq!(get("RANK"), Some("5"));
        assert_eq!(get("LOCAL_RANK"), Some("2"));
        assert_eq!(get("WORLD_SIZE"), Some("6"));
        assert_eq!(get("LOCAL_WORLD_SIZE"), Some("3"));
        assert_eq!(get("GROUP_RANK"), Some("1"));
        assert_eq!(get("ROLE_RANK"), Some("5"));
        assert_eq!(get("ROLE_WORLD_SIZE"), Some("6"));
        assert_eq!(get("MASTER_ADDR"), Some("h0"));
        assert_eq!(get("MASTER_PORT"), Some("1234"));
        assert_eq!(get("TORCHELASTIC_RUN_ID"), Some("none"));
        assert_eq!(get("ASRFORGE_RDZV_TOKEN"), Some("t"));
    }

    #[test]
    fn plans_outside_the_world_are_refused() {
        assert!(plan(1).validate().is_ok());
        let e = NodePlan { node_rank: 2, ..plan(1) }.validate().unwrap_err().to_string();
        assert_eq!(e, "config key `--node_rank`: expected 0 <= node_rank < nnodes (2), found 2");
        let e = NodePlan { world_size: 5, ..plan(1) }.validate().unwrap_err().to_string();
        assert_eq!(e, "config key `--world_size`: expected a world of at least 6 to hold the node's ranks 3..5, found 5");
    }

    #[test]
    fn tokens() {
        assert_eq!(job_token(Some("abc".into()), 4, false, None).unwrap(), "abc");
        let a = job_token(None, 1, false, None).unwrap();
        let b = job_token(None, 1, false, None).unwrap();
        assert_eq!(a.len(), 32);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b, "two fresh tokens differ");
        assert_eq!(job_token(None, 2, false, Some("job7")).unwrap(), token_from_rdzv_id("job7"));
        assert_ne!(token_from_rdzv_id("job7"), token_from_rdzv_id("job8"));
        // FNV-1a of the empty input is its offset basis; check the hash itself on one byte:
        // (basis ^ 0x61) * prime for "a".
        let one = (0xcbf2_9ce4_8422_2325u64 ^ 0x61).wrapping_mul(0x0000_0100_0000_01b3);
        assert_eq!(one, 0xaf63_dc4c_8601_ec8c, "FNV-1a(\"a\") from its published test vector");
        let e = job_token(None, 2, false, None).unwrap_err().to_string();
        assert!(e.contains("ASRFORGE_RDZV_TOKEN") && e.contains("--rdzv_id") && e.contains("2 nodes"), "{e}");
    }
}
