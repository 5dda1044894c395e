"""basin.experiments"""
